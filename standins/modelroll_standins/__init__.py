"""Stand-in model servers: ``model`` (the model protocol at a cost formula), ``llm`` (an
OpenAI-compatible engine) and ``engine`` (its simulated iteration-level scheduler)."""
