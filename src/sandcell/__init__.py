"""sandcell: disposable, isolated Linux sandboxes for untrusted code."""

__version__ = "0.1.0"
