"""The local web viewer over runs (`stacx view RUN...`): read-only, server-rendered.

Rooms: ``source`` (the runs' logs as one read-only DuckDB connection, re-opened when a live
run's files change, and the run's tokenizer), ``html`` (escaping, tables, inline SVG charts,
the page frame), ``pages`` (runs, episodes, lineage, SQL, compare), ``episode`` (one episode,
decoded token by token), ``app`` (the aiohttp application and its guards). The CSS and the
few lines of JS are files in ``static/``, served from the package: no asset is fetched from
the internet.
"""
