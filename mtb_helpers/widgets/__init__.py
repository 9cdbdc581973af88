"""ipywidgets explorers. Core widgets only (sliders, dropdowns, HTML, Image, Output), so they
work on ipywidgets 7.7 (Colab) and 8 (JupyterLab 4, Binder). Every explorer is a
``frame.live_view``: its controls, and below them its texts, tables and figures, updated in place
on every change; each topic's ``widget.py`` says what to run and what to show."""
