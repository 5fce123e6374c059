"""Authentication (SASL PLAIN, SCRAM-SHA-256/512) and authorization (ACLs), sans IO.

The broker's connection layer feeds SASL tokens to a ``SaslServer`` and asks the ``Authorizer``
whether a principal may do an operation on a resource; our client uses the client halves.
"""
