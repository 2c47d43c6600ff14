"""Isolation primitives: the sandbox protocol, the local (bwrap) and Docker sandboxes, their shell."""
