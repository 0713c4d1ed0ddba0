"""fragscope: finds out why a GPU model server got slow or ran out of memory."""
__version__ = "0.1.0"
