"""What a job is: the endpoint table (type to method, path, limit key), reading
a CSV or JSON Lines jobs file into rows, and the `Job` value with its field rules.

May import: core.
"""
