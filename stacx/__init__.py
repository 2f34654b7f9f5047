"""STACX: train and evaluate LLM agents as an event-sourced async actor system."""

__version__ = "0.1.0"
