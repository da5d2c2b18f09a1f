"""Training of the shipped OCRia-mini target and DFlash2 drafter (``python -m ocria.train``)."""
