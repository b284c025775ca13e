"""Lesson 01: Padding-free training gives an abnormally high loss."""
