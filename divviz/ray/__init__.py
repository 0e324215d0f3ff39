"""divviz's runs on a Ray cluster: the runs folder's queue trained by Ray's workers instead of this machine's pool.

    pip install 'divviz[ray]'                     # Ray 2.52; nothing else in divviz imports it
    DIVVIZ_RAY=local streamlit run app.py         # or ray://HOST:10001, or auto: an existing cluster
    divviz claims --lm … --ray [ADDRESS]

`pool.py` is the driver; the engine starts it by name in place of its own pool when $DIVVIZ_RAY is set
(`runner.ensure_pool`), and imports nothing of it.
"""
