"""Errors raised for bad input. Each message names the problem and the fix.

All are ``ValueError`` subclasses, so callers that catch ``ValueError`` keep working; the CLI prints
the message on one line and exits with status 2.
"""


class VitlabError(ValueError):
    """Base class of every user-facing vitlab error."""


class ConfigError(VitlabError):
    """An invalid model or run configuration."""


class UnknownOptionError(ConfigError, TypeError):
    """A model option that does not exist (a misspelt or foreign keyword), as against a bad value of a known one.

    Also a ``TypeError``, as a Python call with an unexpected keyword raises: timm's factory contract, so code
    calling ``timm.create_model("vitlab_P", bogus=1)`` catches it as it would for timm's own models.
    """


class NumericalError(VitlabError):
    """A computation that failed numerically (a NaN or infinite loss or gradient), not a bad option; the message
    names the likely causes and the options that avoid them."""


class DataError(VitlabError):
    """A dataset that cannot be found, downloaded or read."""


class CheckpointError(VitlabError):
    """A checkpoint or weight file that cannot be loaded."""


class WriteError(VitlabError, OSError):
    """A file that could not be written (a full disk, a read-only folder); the previous version is kept.

    Also an ``OSError``, so callers catching write failures keep working.
    """
