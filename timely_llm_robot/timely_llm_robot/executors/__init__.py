"""Robot-side executors: run dispatched plan segments on a drone or arm, real or simulated."""
