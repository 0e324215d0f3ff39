"""divviz's tests, a package: a dependency that ships a top-level `tests` package (verl 0.9.1 does) must not shadow them."""
