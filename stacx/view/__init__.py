"""The local web viewer over runs (`stacx view RUN...`): read-only, server-rendered. ``source``
reads the logs, ``html`` builds markup and charts, ``pages`` and ``episode`` render, ``app`` serves
and guards; CSS and JS are files in ``static/``, nothing is fetched from the internet.

Design: docs/view.md
"""
