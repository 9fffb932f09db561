"""distmis: distributed hyperparameter search for 3D medical image segmentation.

Importing the package is cheap on purpose: TensorFlow and Ray are imported only by the
modules that need them, so ``distmis --help`` and config validation stay fast.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
