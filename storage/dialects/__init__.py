"""One small module per database the state can live in: SQLite (the embedded default) and PostgreSQL (a team server).

Each gives a connection with the same interface (`execute` with `?` placeholders, rows by name and by index,
`fetchone`/`fetchall`, `rowcount`) and carries its dialect as `connection.dialect`: how a write transaction
begins, the database's clock, whether a table exists, how a migration's DDL is written for it.
"""
