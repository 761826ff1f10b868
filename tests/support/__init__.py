"""What the tests share: the real stack they start, its client, stand-in models, and checks
several test files make; no tests of their own."""
