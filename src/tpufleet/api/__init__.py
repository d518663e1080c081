"""The REST API (FastAPI) and the fleet web page."""
