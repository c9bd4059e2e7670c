from playlist import Track, add_track, by_artist, new_playlist, total_seconds

SO_WHAT = Track("So What", "Miles Davis", 562)
BLUE_IN_GREEN = Track("Blue in Green", "Miles Davis", 337)
NAIMA = Track("Naima", "John Coltrane", 261)


def test_add_track():
    jazz = new_playlist("jazz")
    assert add_track(jazz, SO_WHAT)
    assert jazz["tracks"] == [SO_WHAT]


def test_a_track_is_added_once():
    jazz = new_playlist("jazz")
    assert add_track(jazz, NAIMA)
    assert not add_track(jazz, NAIMA)
    assert jazz["tracks"] == [NAIMA]


def test_new_playlists_start_empty():
    first = new_playlist("morning")
    add_track(first, BLUE_IN_GREEN)
    second = new_playlist("evening")
    assert second["tracks"] == []


def test_total_seconds():
    mix = new_playlist("mix", [SO_WHAT, NAIMA])
    assert total_seconds(mix) == 823


def test_by_artist():
    mix = new_playlist("mix")
    for track in (SO_WHAT, NAIMA, BLUE_IN_GREEN):
        add_track(mix, track)
    assert by_artist(mix, "Miles Davis") == ["So What", "Blue in Green"]
