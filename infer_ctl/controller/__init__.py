"""The kopf controller: thin handlers that parse, call the engine, actuate and write status."""
