"""The admin client (admin.py) and its parts: consumer groups, configs, SCRAM credentials.
The public names are ``oncelog``'s (``from oncelog import Admin``)."""
