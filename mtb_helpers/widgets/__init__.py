"""ipywidgets explorers. Core widgets only (interact, sliders, dropdowns, Output), so they work on
ipywidgets 7.7 (Colab) and 8 (JupyterLab 4, Binder). They call the pure functions and checks of the
package and draw with the topics' plots. Each explorer lives in its topic's ``widget.py``; this package
holds the frame they all share (``frame.py``)."""
