"""batchrun: spread a queue of API jobs over time, inside the API's rate limits."""

__version__ = "0.3.0"
