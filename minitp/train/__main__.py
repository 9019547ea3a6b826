"""``python -m minitp.train`` (and ``torchrun ... -m minitp.train``) runs this."""

from .cli import main

main()
