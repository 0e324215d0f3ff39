"""Views: pure figures and the numbers each page draws (plain-dict plotly figures, no Streamlit).

May import: everything above it (catalogue, loss layer, bandit, engine, evidence); never `divviz.app` or streamlit.
"""
