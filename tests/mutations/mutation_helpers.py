"""Small helpers the mutation tables share."""


def set_all(rows, field, value):
    for row in rows:
        row[field] = value
