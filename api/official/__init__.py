"""The official MiniCPM-o demo's frontend on omniserve: its HTTP API in the official gateway's
shapes, the assets its pages fetch, and its static pages (``OMNISERVE_STATIC_DIR``).
"""
