"""Kept for sites that still run `python setup.py develop`; pyproject.toml is the source."""

from setuptools import setup

setup()
