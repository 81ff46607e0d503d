"""How `make test` shares the suite among pytest-xdist workers (`--dist loadgroup`, groups set in conftest.py)."""


def worker_groups(servers_of: dict[str, set[str]]) -> dict[str, str]:
    """Module -> its xdist group: servers used by one module are one group (with every module that uses any of
    them), named after them; a module without a server is its own group."""
    together: list[set[str]] = []
    for used in servers_of.values():
        overlapping = [g for g in together if g & used]
        merged = set(used).union(*overlapping)
        together = [g for g in together if not g & used] + ([merged] if merged else [])
    name = {server: "+".join(sorted(g)) for g in together for server in g}
    return {module: name[min(used)] if used else module for module, used in servers_of.items()}
