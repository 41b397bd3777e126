"""The package version, on its own so that lower layers (the manifest) need not import the
package root, which names the public API."""

__version__ = "0.1.0"
