"""timely_llm: segmented, time-utility-aware LLM serving for robots (TimelyLLM)."""

__version__ = "0.1.0"
