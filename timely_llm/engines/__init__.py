"""Engines behind one interface (``base.Engine``): the calibrated simulator and embedded vLLM."""
