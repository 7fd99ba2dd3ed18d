"""The one rule for the generated parts of the docs: a page holds one BEGIN line before one
END line (HTML comments), and a tool rewrites only what lies between them, atomically
(bench_record.py, depth_doc.py, depth_scale_doc.py, real_corpus.py)."""
import os


def replace_between(path, begin, end, body):
    """Writes BODY between the BEGIN and END lines of the page at PATH. Raises ValueError
    "<path>: needs one '<begin>' line before one '<end>' line" (the page untouched) or
    OSError (unreadable)."""
    with open(path) as f:
        text = f.read()
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError("%s: needs one '%s' line before one '%s' line" % (path, begin, end))
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    body = body if body.endswith("\n") else body + "\n"
    with open(path + ".tmp", "w") as f:
        f.write(head + begin + "\n" + body + end + tail)
    os.replace(path + ".tmp", path)
