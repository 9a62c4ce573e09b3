"""Adapters that run other frameworks' agents on sandbox sessions.

Each adapter is a subpackage that imports its framework; `import sandbox` imports none.
"""
