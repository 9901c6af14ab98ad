/* The hit path of cute-aot ops, in C: a table from the input tensors' shapes to the TVM-FFI
 * function that serves them, itself a TVM-FFI function. Linked into every bundle library.
 *
 * In Python, reading `x.shape` and `w.shape`, hashing them and looking them up costs about as
 * much again as the launch's own argument handling. Here the shapes are read from the DLTensors
 * TVM-FFI already converted for the call, and the kernel is called with those same arguments.
 *
 *   d = library["cute_aot_dispatch_new"](num_inputs)  -> the table, a TVM-FFI function
 *   d(x, w, out)             the kernel resolved for x's and w's shapes, called with (x, w, out);
 *                            returns 1, calling nothing, when the table holds no kernel for them
 *                            (the op then takes its Python path, which resolves and puts)
 *   d(PUT, function, dims...) dims: per input, -1 for None, else ndim then each size
 *   d(CLEAR)                  forget every entry (bundles loaded, mode changed)
 *   d(SIZE)                   how many entries it holds
 *
 * One mutex guards the table; a call holds a reference to its kernel while it runs, so a
 * CLEAR from another thread never frees a function in use. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <tvm/ffi/c_api.h>

#define MAX_KEY 24     /* int64 values per key: enough for 4 inputs of rank 4 */
#define SLOTS 1024     /* open addressing, power of two */
#define MAX_USED 768   /* keep probes short: puts beyond this are refused */

enum { PUT = 1, CLEAR = 2, SIZE = 3 };
enum { MISS = 1 };

typedef struct {
  int64_t key[MAX_KEY];
  int32_t length;
  TVMFFIObjectHandle function; /* NULL: empty slot */
} Slot;

typedef struct {
  pthread_mutex_t lock;
  int32_t num_inputs;
  int32_t used;
  Slot slots[SLOTS];
} Table;

static uint64_t hash_key(const int64_t* key, int32_t length) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a over the values */
  for (int32_t i = 0; i < length; ++i) {
    h ^= (uint64_t)key[i];
    h *= 1099511628211ull;
  }
  return h;
}

static DLTensor* tensor_of(const TVMFFIAny* any) {
  if (any->type_index == kTVMFFIDLTensorPtr) return (DLTensor*)any->v_ptr;
  if (any->type_index == kTVMFFITensor) return (DLTensor*)((char*)any->v_obj + sizeof(TVMFFIObject));
  return NULL;
}

/* The key of a call's inputs; -1 when an argument is neither a tensor nor None. */
static int32_t call_key(const Table* table, const TVMFFIAny* args, int32_t num_args, int64_t* key) {
  int32_t length = 0;
  if (num_args < table->num_inputs) return -1;
  for (int32_t i = 0; i < table->num_inputs; ++i) {
    if (args[i].type_index == kTVMFFINone) {
      if (length + 1 > MAX_KEY) return -1;
      key[length++] = -1;
      continue;
    }
    DLTensor* tensor = tensor_of(&args[i]);
    if (tensor == NULL || length + 1 + tensor->ndim > MAX_KEY) return -1;
    key[length++] = tensor->ndim;
    for (int32_t d = 0; d < tensor->ndim; ++d) key[length++] = tensor->shape[d];
  }
  return length;
}

static Slot* find(Table* table, const int64_t* key, int32_t length) {
  uint64_t index = hash_key(key, length) & (SLOTS - 1);
  for (int32_t probe = 0; probe < SLOTS; ++probe) {
    Slot* slot = &table->slots[(index + probe) & (SLOTS - 1)];
    if (slot->function == NULL) return slot;
    if (slot->length == length && memcmp(slot->key, key, sizeof(int64_t) * length) == 0) {
      return slot;
    }
  }
  return NULL;
}

static int set_int(TVMFFIAny* result, int64_t value) {
  result->type_index = kTVMFFIInt;
  result->zero_padding = 0;
  result->v_int64 = value;
  return 0;
}

static int fail(const char* kind, const char* message) {
  TVMFFIErrorSetRaisedFromCStr(kind, message);
  return -1;
}

static void clear(Table* table) {
  for (int32_t i = 0; i < SLOTS; ++i) {
    if (table->slots[i].function != NULL) TVMFFIObjectDecRef(table->slots[i].function);
  }
  memset(table->slots, 0, sizeof(table->slots));
  table->used = 0;
}

static int put(Table* table, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {
  if (num_args < 2 || args[1].type_index != kTVMFFIFunction) {
    return fail("TypeError", "cute_aot dispatch PUT takes a TVM-FFI function, then the dims");
  }
  int64_t key[MAX_KEY];
  int32_t length = num_args - 2;
  if (length > MAX_KEY) return fail("ValueError", "cute_aot dispatch PUT: too many dims");
  for (int32_t i = 0; i < length; ++i) {
    if (args[2 + i].type_index != kTVMFFIInt) return fail("TypeError", "dims must be integers");
    key[i] = args[2 + i].v_int64;
  }
  pthread_mutex_lock(&table->lock);
  Slot* slot = table->used < MAX_USED ? find(table, key, length) : NULL;
  int64_t stored = 0;
  if (slot != NULL) {
    TVMFFIObjectHandle function = args[1].v_obj;
    TVMFFIObjectIncRef(function);
    if (slot->function != NULL) {
      TVMFFIObjectDecRef(slot->function);
    } else {
      table->used += 1;
    }
    memcpy(slot->key, key, sizeof(int64_t) * length);
    slot->length = length;
    slot->function = function;
    stored = 1;
  }
  pthread_mutex_unlock(&table->lock);
  return set_int(result, stored); /* 0: the table is full; the op keeps its Python path */
}

static int dispatch(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {
  Table* table = (Table*)self;
  if (num_args > 0 && args[0].type_index == kTVMFFIInt) {
    switch (args[0].v_int64) {
      case PUT:
        return put(table, args, num_args, result);
      case CLEAR:
        pthread_mutex_lock(&table->lock);
        clear(table);
        pthread_mutex_unlock(&table->lock);
        return set_int(result, 0);
      case SIZE:
        return set_int(result, table->used);
      default:
        return fail("ValueError", "cute_aot dispatch: unknown control code");
    }
  }
  int64_t key[MAX_KEY];
  int32_t length = call_key(table, args, num_args, key);
  if (length < 0) return set_int(result, MISS);
  pthread_mutex_lock(&table->lock);
  Slot* slot = find(table, key, length);
  TVMFFIObjectHandle function = slot != NULL ? slot->function : NULL;
  if (function != NULL) TVMFFIObjectIncRef(function);
  pthread_mutex_unlock(&table->lock);
  if (function == NULL) return set_int(result, MISS);
  int status = TVMFFIFunctionCall(function, (TVMFFIAny*)args, num_args, result);
  TVMFFIObjectDecRef(function);
  return status;
}

static void destroy(void* self) {
  Table* table = (Table*)self;
  clear(table);
  pthread_mutex_destroy(&table->lock);
  free(table);
}

/* cute_aot_dispatch_new(num_inputs) -> a new, empty table (a TVM-FFI function). */
TVM_FFI_DLL_EXPORT int __tvm_ffi_cute_aot_dispatch_new(void* self, const TVMFFIAny* args,
                                                       int32_t num_args, TVMFFIAny* result) {
  (void)self;
  if (num_args != 1 || args[0].type_index != kTVMFFIInt || args[0].v_int64 < 1) {
    return fail("TypeError", "cute_aot_dispatch_new takes the number of inputs (>= 1)");
  }
  Table* table = (Table*)calloc(1, sizeof(Table));
  if (table == NULL) return fail("MemoryError", "cute_aot_dispatch_new: out of memory");
  pthread_mutex_init(&table->lock, NULL);
  table->num_inputs = (int32_t)args[0].v_int64;
  TVMFFIObjectHandle function = NULL;
  if (TVMFFIFunctionCreate(table, dispatch, destroy, &function) != 0) {
    destroy(table);
    return -1;
  }
  result->type_index = kTVMFFIFunction;
  result->zero_padding = 0;
  result->v_obj = (TVMFFIObject*)function;
  return 0;
}
