"""The control plane's core: what each Lambda does, in terms of small ports (see `ports`)."""
