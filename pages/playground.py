import streamlit as st

st.title("Block manager playground")
