"""`tandem serve --isolate`: the engine and its models in a child process the API process supervises."""

__all__: list[str] = []
