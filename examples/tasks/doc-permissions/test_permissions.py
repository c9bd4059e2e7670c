from permissions import Document, User, can_delete, can_edit, editable

DOC = Document(id=1, owner_id=10)


def test_owner_can_edit():
    assert can_edit(User(id=10), DOC)


def test_others_cannot_edit():
    assert not can_edit(User(id=11), DOC)


def test_admin_can_edit_any_document():
    assert can_edit(User(id=99, is_admin=True), DOC)


def test_suspended_owner_cannot_edit():
    assert not can_edit(User(id=10, suspended=True), DOC)


def test_suspended_admin_cannot_edit():
    assert not can_edit(User(id=99, is_admin=True, suspended=True), DOC)


def test_archived_documents_are_kept():
    assert not can_delete(User(id=10), Document(id=2, owner_id=10, archived=True))
    assert can_delete(User(id=10), DOC)


def test_suspended_admin_edits_nothing():
    docs = [DOC, Document(id=2, owner_id=99), Document(id=3, owner_id=12)]
    assert editable(User(id=99, is_admin=True, suspended=True), docs) == []
    assert editable(User(id=99, is_admin=True), docs) == [1, 2, 3]
