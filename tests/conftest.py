"""Shared test configuration.

``pytest --hypothesis-profile=thorough`` runs the property tests with many more examples.
"""

from hypothesis import settings

settings.register_profile("thorough", max_examples=2000, deadline=None)
