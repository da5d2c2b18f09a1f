"""User-facing errors: one line that names what is wrong, shown without a traceback by the CLI."""


class OcriaError(Exception):
    """An error caused by the user's input (a file, a flag, a request), not by a bug."""


class CheckpointError(OcriaError):
    """A checkpoint directory or file is missing, malformed, or does not match the config."""


class ConfigError(OcriaError):
    """A config.json / YAML file has an unknown type or inconsistent fields."""


class RequestError(OcriaError):
    """A generation request is invalid (bad image, bad sampling parameters, too long)."""
