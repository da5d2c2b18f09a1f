"""ocria: build and serve the OCRia document-OCR VLM (Qwen3.5 hybrid target + DFlash2 drafter)."""

__version__ = "0.1.0"
