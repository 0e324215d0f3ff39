"""The Streamlit glue: controls bound to the URL, catalogue widgets, charts with downloads, who owns which run.

With `app_pages/`, the only code that imports streamlit. May import every layer above it.
"""
