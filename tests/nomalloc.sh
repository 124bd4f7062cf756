#!/bin/sh
# The library makes no heap allocation: no object in the archive references an allocator symbol.
# Usage: nomalloc.sh build/libqtrain.a
lib=${1:?usage: nomalloc.sh LIBRARY}
if [ ! -f "$lib" ]; then
    echo "FAIL library_has_no_allocator_calls: $lib not found"
    exit 1
fi
hits=$(nm -u -A "$lib" | grep -E ' U (malloc|calloc|realloc|free|strdup|strndup|aligned_alloc|posix_memalign|valloc|memalign|reallocarray|qsort)$')
if [ -n "$hits" ]; then
    echo "FAIL library_has_no_allocator_calls:"
    echo "$hits" | sed 's/^/  /'
    exit 1
fi
# The check must see the objects: an empty symbol table would pass vacuously.
count=$(nm -u -A "$lib" | grep -c ' U ')
if [ "$count" -lt 10 ]; then
    echo "FAIL library_has_no_allocator_calls: only $count undefined symbols read from $lib"
    exit 1
fi
echo "PASS library_has_no_allocator_calls ($count undefined references checked)"
