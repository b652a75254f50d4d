# Type hints of listenhub.errors (the code is errors.py; mypy's stubtest
# holds the two together).

class ListenhubError(Exception): ...

class ClosedError(ListenhubError):
    def __init__(self, msg: str = ...) -> None: ...

class InvalidNameError(ListenhubError):
    q: str
    reason: str
    def __init__(self, q: str, reason: str) -> None: ...

class LimitError(InvalidNameError): ...

class NackError(ListenhubError):
    q: str
    reason: str
    def __init__(self, q: str, reason: str) -> None: ...

class AckTimeoutError(ListenhubError):
    q: str
    timeout: float
    def __init__(self, q: str, timeout: float) -> None: ...

class ConnError(ListenhubError):
    op: str
    path: str
    cause: object
    def __init__(self, op: str, path: str, cause: object) -> None: ...

class ForkedError(ClosedError):
    parent_pid: int
    def __init__(self, parent_pid: int) -> None: ...

class RefusedError(ListenhubError):
    path: str
    reason: str
    def __init__(self, path: str, reason: str) -> None: ...

class FailoverError(ListenhubError):
    hub: object
    local: object
    def __init__(self, hub: object, local: object) -> None: ...
