"""batchrun: spread a queue of API jobs over time, inside the API's rate limits."""

__version__ = "0.1.0"
