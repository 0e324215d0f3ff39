"""Tour: the workshop walkthrough inside the app, each step with its link, what to do, and what to notice, its numbers
computed now by the functions the pages use (`divviz.views.tour`; README's walkthrough is made from the same)."""

import streamlit as st

from divviz.app import widgets
from divviz.views import tour

st.title("Tour: the workshop walkthrough")
st.write("About 35 minutes, one page after another. Each step's link opens its exact view (in a new tab); the numbers "
         "to expect are computed now, by the same functions the pages use, so what you read here is what the page "
         "shows.")

for n, step in enumerate(tour.STEPS, 1):
    with widgets.shown_errors():
        st.subheader(f"{n}. {step.title}")
        st.markdown(f"[Open this view]({step.link().lstrip('/')})")
        st.markdown(f"**Do:** {step.do}")  # divviz's own text, with Markdown emphasis
        with st.spinner("Computing the numbers to expect…"):
            st.markdown(f"**Notice:** {step.text()}")
