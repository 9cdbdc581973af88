"""ipywidgets explorers. Core widgets only (interact, sliders, dropdowns, Output), so they work on
ipywidgets 7.7 (Colab) and 8 (JupyterLab 4, Binder). They call the pure functions and checks of the
package and draw with ``mtb_helpers.plots``; one submodule per notebook."""
