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


def slow_groups_first(groups: list[str], slow: list, own: list) -> list[int]:
    """The order to run tests in, given each test's group, whether it is slow and whether its group is its own
    mark (tests spread that way are the longest): groups of such marks first, then the groups holding a slow test,
    each test otherwise where it was (so a module's tests stay together)."""
    slow_groups = {g for g, is_slow in zip(groups, slow, strict=True) if is_slow}
    own_groups = {g for g, is_own in zip(groups, own, strict=True) if is_own}
    return sorted(range(len(groups)), key=lambda i: (groups[i] not in own_groups, groups[i] not in slow_groups))
