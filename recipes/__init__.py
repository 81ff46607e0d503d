"""Calibration recipes and DeepSpeed configs, shipped as package data (`duocal.recipes`): `duocal
recipes list` names them, `duocal recipes copy NAME DIR` copies one out to edit."""
