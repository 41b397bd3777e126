"""The Python API: jobs, plans and releases over DataFrames and PCollections (issue 22).

`dppipeline` re-exports the public names lazily (`dppipeline.__getattr__`), so that
`import dppipeline` stays cheap. Everything else in the package is private and may change.
"""
