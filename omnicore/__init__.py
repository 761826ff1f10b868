"""The shared base every part of omniserve imports: settings, audio formats, logging.

It sits at the bottom of the import graph: it imports nothing from ``api``, ``streaming``,
``tasks``, ``inference`` or ``omniserve`` (the command line on top).
"""

__version__ = "0.1.0"
