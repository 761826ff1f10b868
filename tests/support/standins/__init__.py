"""Stand-ins for the real model and the C++ server, usable from tests and real worker processes."""
