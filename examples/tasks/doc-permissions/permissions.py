"""Who may edit and delete documents in a small wiki."""

from dataclasses import dataclass


@dataclass
class User:
    id: int
    is_admin: bool = False
    suspended: bool = False


@dataclass
class Document:
    id: int
    owner_id: int
    archived: bool = False


def can_edit(user, doc):
    """A user may edit a document when they are not suspended and are its owner or an admin."""
    return not user.suspended and user.id == doc.owner_id or user.is_admin


def can_delete(user, doc):
    """Deleting needs the right to edit, and archived documents are never deleted."""
    return can_edit(user, doc) and not doc.archived


def editable(user, docs):
    """The ids of the documents the user may edit, in the given order."""
    return [doc.id for doc in docs if can_edit(user, doc)]
