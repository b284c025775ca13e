"""Small helpers the mutation tables share."""


def set_all(rows, field, value):
    for row in rows:
        row[field] = value


def cycled(values: list, length: int) -> list:
    """``values`` repeated and cut to ``length``: a cpu run's series stretched to a gpu profile's longer one."""
    return (values * (length // len(values) + 1))[:length]
