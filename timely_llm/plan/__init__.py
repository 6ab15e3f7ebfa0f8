"""The plan language: a robot's skills and its file, its prompt, its plan grammar and the segmenter that cuts
generated text into executable statements. It imports nothing of the scheduling core above it."""
