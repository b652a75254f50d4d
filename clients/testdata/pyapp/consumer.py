"""A consumer of the installed wheel: run from outside the source tree, it
checks that the package is the venv's (with its py.typed marker), gets a
wake with a payload through the hub at argv[1] on argv[2], then makes a
Failover on a socket nobody serves (argv[3]) that must go local through
psycopg and get a wake there too. mypy --strict checks this file against the
installed package's hints."""

import os
import sys

import listenhub


def first_payload(x: "listenhub.Client | listenhub.Failover", what: str) -> None:
    while True:
        ev = x.get(timeout=20.0)
        if ev is None:
            raise SystemExit(f"no wake {what} within 20 s")
        if isinstance(ev, listenhub.Wake) and ev.payload is not None:
            return


def main() -> None:
    sock, q, no_hub, url = sys.argv[1:5]
    here = os.path.dirname(listenhub.__file__)
    if not here.startswith(sys.prefix):
        raise SystemExit(f"listenhub imported from {here}, not from the venv {sys.prefix}")
    if not os.path.exists(os.path.join(here, "py.typed")):
        raise SystemExit("the installed package has no py.typed")

    with listenhub.connect(sock) as c:
        c.subscribe(q)
        first_payload(c, "through the hub")
    print("python: wake through the hub")

    f = listenhub.Failover(no_hub, database_url=url, one_way=True)
    try:
        if f.mode != listenhub.LOCAL:
            raise SystemExit(f"mode {f.mode}, want local")
        f.subscribe(q)
        first_payload(f, "on the local listener")
    finally:
        f.close()
    print("python: wake on the local listener (psycopg)")


if __name__ == "__main__":
    main()
