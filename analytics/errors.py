"""The error every store raises for what it cannot open, read or write; its message says which store and why."""


class StoreError(RuntimeError):
    pass
